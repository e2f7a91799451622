"""Properties every fusion plan must have, checked on random DAGs.

- groups and unfused nodes partition the graph;
- each group is convex (no path leaves it and comes back), so the graph of groups is acyclic
  and each group can run as one node in topological order;
- the depth and input bounds hold.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx_builder import const_i64, model, node, weights

from onnxfuse.frontend.loader import load_model
from onnxfuse.fusion.partition import FusionOptions
from onnxfuse.fusion.plan import plan_fusion

SHAPE = (4, 4)
OPS = ["Relu", "Sigmoid", "Add", "Mul", "Transpose", "MatMul", "ReduceAdd", "SplitConcat", "Gather", "Hardmax"]


@st.composite
def random_dags(draw):
    """A random DAG of [4, 4] float values built from ops of every pattern kind."""
    n = draw(st.integers(2, 24))
    values = ["x"]
    nodes, inits = [], {"idx": const_i64(3, 1, 0, 2), "axes": const_i64(1), "w": weights(4, 4)}
    for i in range(n):
        op = draw(st.sampled_from(OPS))
        a = draw(st.sampled_from(values))
        b = draw(st.sampled_from(values))
        out = f"v{i}"
        if op in ("Relu", "Sigmoid", "Hardmax"):
            nodes.append(node(op, [a], out))
        elif op in ("Add", "Mul"):
            nodes.append(node(op, [a, b], out))
        elif op == "Transpose":
            nodes.append(node(op, [a], out, perm=[1, 0]))
        elif op == "MatMul":
            nodes.append(node(op, [a, draw(st.sampled_from([b, "w"]))], out))
        elif op == "Gather":
            nodes.append(node(op, [a, "idx"], out, axis=0))
        elif op == "ReduceAdd":  # a reduction, broadcast back to [4, 4]
            nodes.append(node("ReduceSum", [a, "axes"], f"{out}_r", keepdims=1))
            nodes.append(node("Add", [f"{out}_r", b], out))
        else:  # a tuple-producing split rejoined by a concat
            nodes.append(node("Split", [a, "halves"], [f"{out}_a", f"{out}_b"], axis=0))
            inits["halves"] = const_i64(2, 2)
            nodes.append(node("Sigmoid", [f"{out}_a"], f"{out}_s"))
            nodes.append(node("Concat", [f"{out}_b", f"{out}_s"], out, axis=0))
        values.append(out)
    consumed = {i for nd in nodes for i in nd.input}
    sinks = [v for v in values[1:] if v not in consumed]
    extra = draw(st.lists(st.sampled_from(values[1:]), max_size=2))
    outputs = list(dict.fromkeys(sinks + extra))
    return model(nodes, {"x": SHAPE}, {o: SHAPE for o in outputs}, inits)


def _group_graph(graph, plan):
    """Map each node to a group id (unfused nodes get their own) and return the group edges."""
    owner = {}
    for gid, g in enumerate(plan.groups):
        for i in g.node_indices:
            owner[i] = ("g", gid)
    for u in plan.unfused:
        owner[u.node_index] = ("n", u.node_index)
    edges = {(owner[i], owner[j]) for i in range(len(graph.nodes)) for j in graph.successors(i) if owner[i] != owner[j]}
    return owner, edges


def _is_acyclic(nodes, edges) -> bool:
    succ = {n: [] for n in nodes}
    indeg = {n: 0 for n in nodes}
    for a, b in edges:
        succ[a].append(b)
        indeg[b] += 1
    ready = [n for n in nodes if indeg[n] == 0]
    seen = 0
    while ready:
        n = ready.pop()
        seen += 1
        for m in succ[n]:
            indeg[m] -= 1
            if indeg[m] == 0:
                ready.append(m)
    return seen == len(nodes)


def _is_convex(graph, members: set[int]) -> bool:
    """No path from the group through an outside node back into the group."""
    outside = [j for i in members for j in graph.successors(i) if j not in members]
    seen = set()
    while outside:
        j = outside.pop()
        if j in seen:
            continue
        seen.add(j)
        for k in graph.successors(j):
            if k in members:
                return False
            outside.append(k)
    return True


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_dags(), st.integers(1, 12), st.integers(1, 8))
def test_plans_partition_the_graph_into_convex_bounded_groups(m, max_depth, max_inputs):
    graph = load_model(m)
    options = FusionOptions(max_depth=max_depth, max_inputs=max_inputs)
    plan = plan_fusion(graph, options)

    grouped = [i for g in plan.groups for i in g.node_indices]
    unfused = [u.node_index for u in plan.unfused]
    assert sorted(grouped + unfused) == list(range(len(graph.nodes)))

    owner, edges = _group_graph(graph, plan)
    assert _is_acyclic(set(owner.values()), edges)
    for g in plan.groups:
        assert 2 <= len(g.node_indices) <= max_depth
        assert len(g.inputs) <= max_inputs
        assert _is_convex(graph, set(g.node_indices))


@settings(max_examples=150, deadline=None)
@given(random_dags())
def test_every_group_output_is_used_outside_or_returned(m):
    graph = load_model(m)
    for g in plan_fusion(graph).groups:
        members = set(g.node_indices)
        assert g.outputs, "a group that hands nothing back would be dead code"
        for name in g.outputs:
            v = graph.value(name)
            assert v.is_graph_output or any(c not in members for c in v.consumers)

