/**
 * @file brigade.h
 * @brief Umbrella header of libbrigade.
 *
 * Train a small GPT for 100 steps in one process:
 *
 * @code
 *   #include <brigade/brigade.h>
 *   #include <stdio.h>
 *
 *   int main(void)
 *   {
 *       bg_train_config_t cfg;
 *       bg_train_config_init(&cfg);          // GPT defaults, AdamW, batch 8
 *       cfg.data_path = "data/kjv.txt";      // GPT: any text file
 *       cfg.steps = 100;
 *       bg_train_result_t res;
 *       if (bg_train(&cfg, &res) != BG_OK) { // pp = dp = 1: one process
 *           fprintf(stderr, "%s\n", bg_last_error());
 *           return 1;
 *       }
 *       printf("loss %.3f -> %.3f\n", res.first_loss, res.final_loss);
 *       return 0;
 *   }
 * @endcode
 *
 * The same program with cfg.pp and cfg.dp set, started on every rank by
 * `brigade launch`, trains one pipeline/data-parallel job. Build it with
 * `cc app.c $(pkg-config --cflags --libs brigade)`, or find_package(brigade)
 * and brigade::brigade in CMake (README.md, "Using brigade as a library").
 *
 * Ownership and threads: each header says who frees what it returns and
 * which calls may run concurrently, in a paragraph at its top. The common
 * rule: an object made by a *_create, *_load or *_search call is the
 * caller's until its *_destroy or *_free; params structs are read during the
 * call only; errors are per thread (bg_last_error).
 */
#ifndef BRIGADE_BRIGADE_H
#define BRIGADE_BRIGADE_H

#include "brigade/status.h"
#include "brigade/core.h"
#include "brigade/backend.h"
#include "brigade/cpu.h"
#include "brigade/layer.h"
#include "brigade/model.h"
#include "brigade/lr.h"
#include "brigade/train.h"
#include "brigade/schedule.h"
#include "brigade/transport.h"
#include "brigade/checkpoint.h"
#include "brigade/executor.h"
#include "brigade/partitioner.h"

#endif
