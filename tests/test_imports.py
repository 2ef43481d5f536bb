"""The package's import graph: no module imports one that imports it back, at any distance
(the layers between packages are import-linter's contracts, run by CI: ``lint-imports``)."""

from __future__ import annotations

import pytest

grimp = pytest.importorskip("grimp")


def test_no_module_of_the_package_is_in_an_import_cycle() -> None:
    graph = grimp.build_graph("paramserver")
    cyclic = []
    for module in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(module):
            if graph.chain_exists(importer=imported, imported=module):
                chain = graph.find_shortest_chain(importer=imported, imported=module)
                cyclic.append(f"{module} -> {' -> '.join(chain or ())}")
    assert cyclic == []
