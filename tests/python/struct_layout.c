/* tests/python/struct_layout.c: prints the size of every public struct the
 * Python binding mirrors, and each field's offset and size, so that
 * test_binding.py can compare them with the ctypes Structures. Headers only:
 * it links nothing. Lines: "TYPE - SIZE" and "TYPE FIELD OFFSET SIZE". */
#include <stddef.h>
#include <stdio.h>

#include "brigade/executor.h"
#include "brigade/model.h"

#define S(T) printf("%s - %zu\n", #T, sizeof(T))
#define F(T, f) printf("%s %s %zu %zu\n", #T, #f, offsetof(T, f), sizeof(((T *)0)->f))

int main(void)
{
    S(bg_shape_t); F(bg_shape_t, n); F(bg_shape_t, t); F(bg_shape_t, c);

    S(bg_model_desc_params_t);
    F(bg_model_desc_params_t, size); F(bg_model_desc_params_t, name); F(bg_model_desc_params_t, input);
    F(bg_model_desc_params_t, vocab); F(bg_model_desc_params_t, seq_len); F(bg_model_desc_params_t, features);
    F(bg_model_desc_params_t, seed);

    S(bg_model_config_t);
    F(bg_model_config_t, size); F(bg_model_config_t, kind); F(bg_model_config_t, layers);
    F(bg_model_config_t, d_model); F(bg_model_config_t, heads); F(bg_model_config_t, seq_len);
    F(bg_model_config_t, vocab); F(bg_model_config_t, in_features); F(bg_model_config_t, classes);
    F(bg_model_config_t, seed); F(bg_model_config_t, tie_embeddings); F(bg_model_config_t, tp);
    F(bg_model_config_t, sequence_parallel); F(bg_model_config_t, precision); F(bg_model_config_t, kv_heads);
    F(bg_model_config_t, ffn_hidden); F(bg_model_config_t, rope_theta); F(bg_model_config_t, experts);
    F(bg_model_config_t, top_k); F(bg_model_config_t, moe_every); F(bg_model_config_t, capacity_factor);
    F(bg_model_config_t, moe_aux_coef); F(bg_model_config_t, moe_gate); F(bg_model_config_t, ep);

    S(bg_optim_config_t);
    F(bg_optim_config_t, size); F(bg_optim_config_t, kind); F(bg_optim_config_t, lr); F(bg_optim_config_t, beta1);
    F(bg_optim_config_t, beta2); F(bg_optim_config_t, eps); F(bg_optim_config_t, momentum);
    F(bg_optim_config_t, weight_decay);

    S(bg_batch_request_t);
    F(bg_batch_request_t, step); F(bg_batch_request_t, microbatch); F(bg_batch_request_t, replica);
    F(bg_batch_request_t, first); F(bg_batch_request_t, in);

    S(bg_batch_source_t);
    F(bg_batch_source_t, batch); F(bg_batch_source_t, seq_len); F(bg_batch_source_t, arg); F(bg_batch_source_t, seq);

    S(bg_executor_params_t);
    F(bg_executor_params_t, size); F(bg_executor_params_t, model); F(bg_executor_params_t, pp);
    F(bg_executor_params_t, dp); F(bg_executor_params_t, tp); F(bg_executor_params_t, schedule);
    F(bg_executor_params_t, chunks); F(bg_executor_params_t, split); F(bg_executor_params_t, nsplit);
    F(bg_executor_params_t, batch); F(bg_executor_params_t, microbatches); F(bg_executor_params_t, optim);
    F(bg_executor_params_t, data); F(bg_executor_params_t, backend); F(bg_executor_params_t, threads);
    F(bg_executor_params_t, comm); F(bg_executor_params_t, recompute); F(bg_executor_params_t, recompute_stages);
    F(bg_executor_params_t, nrecompute_stages); F(bg_executor_params_t, trace_path);
    F(bg_executor_params_t, process_wide);
    F(bg_executor_params_t, schedule_json);
    F(bg_executor_params_t, process_wide); F(bg_executor_params_t, zero);
    F(bg_executor_params_t, emulate); F(bg_executor_params_t, emulate_scale);
    F(bg_executor_params_t, ps); F(bg_executor_params_t, staleness);
    F(bg_executor_params_t, device_mem); F(bg_executor_params_t, ndevice_mem);
    F(bg_executor_params_t, clip_grad); F(bg_executor_params_t, data_seed); F(bg_executor_params_t, ep);
    F(bg_executor_params_t, cp); F(bg_executor_params_t, offload); F(bg_executor_params_t, offload_dir);

    S(bg_eval_result_t);
    F(bg_eval_result_t, loss); F(bg_eval_result_t, tokens); F(bg_eval_result_t, eval_ms);

    S(bg_step_result_t);
    F(bg_step_result_t, step); F(bg_step_result_t, loss); F(bg_step_result_t, tokens); F(bg_step_result_t, step_ms);
    F(bg_step_result_t, tokens_per_s); F(bg_step_result_t, bubble); F(bg_step_result_t, bytes_sent);
    F(bg_step_result_t, peak_bytes); F(bg_step_result_t, stop);
    F(bg_step_result_t, grad_norm); F(bg_step_result_t, ps_role); F(bg_step_result_t, staleness);
    F(bg_step_result_t, bytes_recv); F(bg_step_result_t, optim_ms); F(bg_step_result_t, idle);
    F(bg_step_result_t, live_workers); F(bg_step_result_t, moe_aux); F(bg_step_result_t, moe_dropped);

    S(bg_executor_info_t);
    F(bg_executor_info_t, rank); F(bg_executor_info_t, world); F(bg_executor_info_t, pp_rank);
    F(bg_executor_info_t, dp_rank); F(bg_executor_info_t, stages); F(bg_executor_info_t, chunks);
    F(bg_executor_info_t, params); F(bg_executor_info_t, flops_per_step); F(bg_executor_info_t, predicted_bytes);
    F(bg_executor_info_t, predicted_act_bytes); F(bg_executor_info_t, predicted_stashed);
    F(bg_executor_info_t, peak_stashed); F(bg_executor_info_t, peak_act_bytes); F(bg_executor_info_t, numa_node);
    F(bg_executor_info_t, schedule); F(bg_executor_info_t, zero);

    S(bg_compare_result_t);
    F(bg_compare_result_t, tensors); F(bg_compare_result_t, identical); F(bg_compare_result_t, only_a);
    F(bg_compare_result_t, only_b); F(bg_compare_result_t, shape_mismatch); F(bg_compare_result_t, max_abs);
    F(bg_compare_result_t, max_rel); F(bg_compare_result_t, worst); F(bg_compare_result_t, rel_l2);

    S(bg_layer_t);
    F(bg_layer_t, ops); F(bg_layer_t, name); F(bg_layer_t, nparams); F(bg_layer_t, params);
    F(bg_layer_t, nchildren); F(bg_layer_t, children); F(bg_layer_t, impl); F(bg_layer_t, precision);

    S(bg_param_t);
    F(bg_param_t, name); F(bg_param_t, ndim); F(bg_param_t, shape); F(bg_param_t, numel); F(bg_param_t, init);
    F(bg_param_t, init_value); F(bg_param_t, decay); F(bg_param_t, data); F(bg_param_t, grad);
    F(bg_param_t, split_dim); F(bg_param_t, split_parts); F(bg_param_t, split_blocks); F(bg_param_t, tp_partial); F(bg_param_t, split_ep);

    S(bg_layer_ctx_t);
    F(bg_layer_ctx_t, be); F(bg_layer_ctx_t, in); F(bg_layer_ctx_t, tokens); F(bg_layer_ctx_t, targets);
    F(bg_layer_ctx_t, loss_scale); F(bg_layer_ctx_t, stash); F(bg_layer_ctx_t, wstash); F(bg_layer_ctx_t, scratch);
    F(bg_layer_ctx_t, tp); F(bg_layer_ctx_t, deferred); F(bg_layer_ctx_t, no_backward); F(bg_layer_ctx_t, ep);
    F(bg_layer_ctx_t, cp);

    S(bg_tp_comm_t);
    F(bg_tp_comm_t, size); F(bg_tp_comm_t, rank); F(bg_tp_comm_t, allreduce); F(bg_tp_comm_t, allgather);
    F(bg_tp_comm_t, arg); F(bg_tp_comm_t, iallreduce); F(bg_tp_comm_t, wait); F(bg_tp_comm_t, reduce_scatter);
    F(bg_tp_comm_t, ireduce_scatter); F(bg_tp_comm_t, iallgather); F(bg_tp_comm_t, alltoallv);
    S(bg_layer_ops_t);
    F(bg_layer_ops_t, type); F(bg_layer_ops_t, out_shape); F(bg_layer_ops_t, stash_bytes);
    F(bg_layer_ops_t, wstash_bytes); F(bg_layer_ops_t, scratch_bytes); F(bg_layer_ops_t, fwd_flops);
    F(bg_layer_ops_t, bwd_flops); F(bg_layer_ops_t, forward); F(bg_layer_ops_t, backward_input);
    F(bg_layer_ops_t, backward_weight); F(bg_layer_ops_t, destroy); F(bg_layer_ops_t, loss_classes);
    F(bg_layer_ops_t, tp_cost); F(bg_layer_ops_t, backward);
    return 0;
}
