#!/usr/bin/env python3
"""tests/runtime/random_program.py IN.json OUT.json SEED

A random valid program from a valid one: a random topological order of all
its instructions (every rank together), under the dependencies the validator
states (docs/schedules.md section 5: data dependencies, weight gradients in
microbatch order per stage, send_grad before the W that frees its gradient,
optimizer steps after the rank's other work) plus send -> receive across ranks, then
each rank's list is that order restricted to the rank. Executing the global
order is a run in which every receive comes after its send, so the result is
deadlock-free; brigade's validator is still the judge (the test runs it).
"""
import json, random, sys

src, dst, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
d = json.load(open(src))
rng = random.Random(seed)
nodes = []  # (rank, op)
where = {}  # key -> node index
for r, rk in enumerate(d["ranks"]):
    for op in rk["ops"]:
        k = op["kind"]
        kk = "bwd" if k in ("backward", "backward_input") else k
        key = (kk, op.get("microbatch", -1), op["stage"])
        where[key] = len(nodes)
        nodes.append((r, op))
stage_rank = {op["stage"]: r for r, op in nodes}
S = max(stage_rank) + 1
# model copies (dualpipe: 2): chains of L stages, microbatch mb through copy mb // (M // copies)
copies, M = d.get("copies", 1), d["microbatches"]
L = S // copies
first = lambda s: s % L == 0
last = lambda s: s % L == L - 1
mb0 = lambda s: s // L * (M // copies)
deps = [[] for _ in nodes]
for i, (r, op) in enumerate(nodes):
    k, mb, s = op["kind"], op.get("microbatch", -1), op["stage"]
    need = []
    if k == "forward" and not first(s):
        need.append(("recv_act", mb, s) if stage_rank[s - 1] != r else ("forward", mb, s - 1))
    elif k == "send_act":
        need.append(("forward", mb, s))
    elif k == "recv_act":
        need.append(("send_act", mb, s - 1))
    elif k in ("backward", "backward_input"):
        need.append(("forward", mb, s))
        if not last(s):
            need.append(("recv_grad", mb, s) if stage_rank[s + 1] != r else ("bwd", mb, s + 1))
    elif k == "backward_weight":
        need.append(("bwd", mb, s))
        if ("send_grad", mb, s) in where:  # W frees the gradient that send_grad sends
            need.append(("send_grad", mb, s))
    elif k == "send_grad":
        need.append(("bwd", mb, s))
    elif k == "recv_grad":
        need.append(("send_grad", mb, s + 1))
    elif k == "reduce_grads":
        need += [key for key in where if key[2] == s and key[0] in ("bwd", "backward_weight")]
    elif k == "optimizer_step":
        need.append(("reduce_grads", -1, s))
        need += [key for key, j in where.items() if nodes[j][0] == r and key[0] not in ("reduce_grads", "optimizer_step")]
    if k == "backward" or k == "backward_weight":  # weight gradients add up in microbatch order
        if mb > mb0(s):
            need.append(("backward_weight", mb - 1, s) if ("backward_weight", mb - 1, s) in where else ("bwd", mb - 1, s))
    deps[i] = [where[n] for n in need]
users = [[] for _ in nodes]
left = [len(x) for x in deps]
for i, ds in enumerate(deps):
    for j in ds:
        users[j].append(i)
ready = [i for i in range(len(nodes)) if left[i] == 0]
order = []
while ready:
    i = ready.pop(rng.randrange(len(ready)))
    order.append(i)
    for u in users[i]:
        left[u] -= 1
        if left[u] == 0:
            ready.append(u)
assert len(order) == len(nodes), "the input program has a dependency cycle"
for rk in d["ranks"]:
    rk["ops"] = []
for i in order:
    r, op = nodes[i]
    d["ranks"][r]["ops"].append(op)
d["schedule"] = "random%d" % seed
json.dump(d, open(dst, "w"))
