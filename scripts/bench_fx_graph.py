#!/usr/bin/env python3
"""torch.fx reference for the ferrofx graph IR benchmark.

Runs the same graph workloads as `crates/ferrofx-fx/examples/bench_graph.rs` on torch.fx and
prints one JSON object per workload on stdout:

    {"workload": "build_chain", "nodes": 100000, "seconds": 1.23}

Usage:
    .venv/bin/python scripts/bench_fx_graph.py --nodes 100000 --repeat 1 [--clock cpu|wall]

The Rust side (`cargo run --release -p ferrofx-fx --example bench_graph -- --reference
.venv/bin/python`) starts this script and prints both results side by side.

Workloads (each on a graph of `--nodes` nodes, timing only the named step):
  build_chain     build placeholder x -> N-2 alternating add/mul(cur, x) -> output
  iterate         walk every node, summing num_users of call_function nodes
  lint            Graph.lint()
  codegen         Graph.python_code("self") (values freed after their last use)
  insert_relu     after every add insert relu(add) and reroute add's other users to it
  replace_add     replace every add by sub(same args), reroute users, erase the add
  dce             eliminate_dead_code on a graph whose every other node is dead
  copy            Graph.graph_copy into a new graph (+ its output)
"""

import argparse
import gc
import json
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=1, help="runs per workload; the best is reported")
    parser.add_argument(
        "--clock",
        choices=["cpu", "wall"],
        default="cpu",
        help="cpu: this thread's CPU time (time.thread_time), robust on a shared machine; wall: perf_counter",
    )
    args = parser.parse_args()

    try:
        import torch
        import torch.fx
    except ImportError as exc:  # the Rust side reports this and runs without the reference
        print(json.dumps({"error": f"torch is not importable: {exc}"}))
        return 2

    n = args.nodes
    now = time.thread_time if args.clock == "cpu" else time.perf_counter

    def build_chain():
        g = torch.fx.Graph()
        x = g.placeholder("x")
        cur = x
        for i in range(n - 2):
            cur = g.call_function(torch.add if i % 2 == 0 else torch.mul, (cur, x))
        g.output(cur)
        return g

    def build_half_dead():
        g = torch.fx.Graph()
        x = g.placeholder("x")
        cur = x
        for _ in range((n - 2) // 2):
            cur = g.call_function(torch.add, (cur, x))
            g.call_function(torch.relu, (cur,))
        g.output(cur)
        return g

    def w_iterate(g):
        total = 0
        for node in g.nodes:
            if node.op == "call_function":
                total += len(node.users)
        assert total > 0

    def w_lint(g):
        g.lint()

    def w_codegen(g):
        src = g.python_code("self").src
        assert len(src) > n

    def w_insert_relu(g):
        for node in list(g.nodes):
            if node.op == "call_function" and node.target is torch.add:
                with g.inserting_after(node):
                    relu = g.call_function(torch.relu, (node,))
                node.replace_all_uses_with(relu, delete_user_cb=lambda u, r=relu: u is not r)

    def w_replace_add(g):
        for node in g.nodes:
            if node.op == "call_function" and node.target is torch.add:
                with g.inserting_after(node):
                    new = g.call_function(torch.sub, node.args, node.kwargs)
                node.replace_all_uses_with(new)
                g.erase_node(node)

    def w_dce(g):
        changed = g.eliminate_dead_code()
        assert changed

    def w_copy(g):
        g2 = torch.fx.Graph()
        out = g2.graph_copy(g, {})
        g2.output(out)
        assert len(g2.nodes) == len(g.nodes)

    workloads = [
        ("build_chain", None, lambda _g: build_chain()),
        ("iterate", build_chain, w_iterate),
        ("lint", build_chain, w_lint),
        ("codegen", build_chain, w_codegen),
        ("insert_relu", build_chain, w_insert_relu),
        ("replace_add", build_chain, w_replace_add),
        ("dce", build_half_dead, w_dce),
        ("copy", build_chain, w_copy),
    ]
    for name, setup, work in workloads:
        best = float("inf")
        for _ in range(max(1, args.repeat)):
            g = setup() if setup is not None else None
            gc.collect()
            t0 = now()
            work(g)
            best = min(best, now() - t0)
            del g
        print(json.dumps({"workload": name, "nodes": n, "seconds": best}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
