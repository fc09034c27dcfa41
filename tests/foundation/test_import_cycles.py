"""No import cycle among the project's modules, lazy imports included: a cycle hidden in a function
body still ties two modules together (and fails the day someone moves the import to the top)."""

from __future__ import annotations

import networkx as nx

from tests.support.imports import module_imports, project_modules


def import_graph() -> nx.DiGraph:
    modules = project_modules()
    graph = nx.DiGraph()
    for name, path in modules.items():
        graph.add_node(name)
        graph.add_edges_from((name, dep) for dep in module_imports(path, modules) if dep != name)
    return graph


def test_no_import_cycle() -> None:
    graph = import_graph()
    assert graph.number_of_nodes() > 80 and graph.number_of_edges() > 250
    if not nx.is_directed_acyclic_graph(graph):
        tangles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
        shortest = [" -> ".join([*c, c[0]]) for c in nx.simple_cycles(graph, length_bound=4)]
        raise AssertionError(f"modules that import each other: {tangles}; e.g. " + "; ".join(shortest[:5]))


def test_the_graph_sees_lazy_imports(tmp_path) -> None:  # noqa: ANN001
    a = tmp_path / "a.py"
    a.write_text("def f():\n    from pkg.b import thing\n    import pkg.c\n")
    assert module_imports(a, {"pkg.b": a, "pkg.c": a, "pkg": a}) == {"pkg.b", "pkg.c"}
