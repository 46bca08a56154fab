"""A loader's library that is not installed on the verifying machine is one clear IV505 per library naming the extra
to install, never an IV504 about the artifact (docs/format.md, loaders). The libraries are hidden from the reload children by
packages of the same name, first on PYTHONPATH, that fail to import as an absent one does."""
from __future__ import annotations

import pytest

from fixtures.extra_loaders import reload_package, write_gguf, write_onnx, write_package

pytestmark = pytest.mark.filterwarnings("ignore")


def hide(folder, *names) -> str:
    for name in names:
        (folder / name).mkdir(parents=True)
        (folder / name / "__init__.py").write_text(
            f"raise ModuleNotFoundError(\"No module named '{name}'\", name={name!r})\n")
    return str(folder)


def test_missing_libraries_are_one_IV505_each_naming_the_extra_never_IV504(tmp_path, monkeypatch):
    root = tmp_path / "package"
    (root / "artifacts").mkdir(parents=True)
    write_gguf(root / "artifacts/a.gguf")
    write_gguf(root / "artifacts/b.gguf")
    write_onnx(root / "artifacts/onnx")
    write_package(root, [("a", "gguf", "artifacts/a.gguf", {"loader": "gguf"}),
                         ("b", "gguf", "artifacts/b.gguf", {"loader": "gguf"}),
                         ("exported", "onnx", "artifacts/onnx", {"loader": "onnx"})])
    monkeypatch.setenv("PYTHONPATH", hide(tmp_path / "hidden", "gguf", "onnxruntime"))
    results, findings = reload_package(root)
    assert {r.failure for r in results.values()} == {"missing-library"}, [r.error for r in results.values()]
    assert sorted(f.code for f in findings) == ["IV505", "IV505"]
    by_extra = {f.message.split("pip install ")[1].split()[0]: f for f in findings}
    assert set(by_extra) == {"'itera-verify[gguf]'", "'itera-verify[onnx]'"}
    assert "(2 artifact(s): a, b)" in by_extra["'itera-verify[gguf]'"].message
    assert "onnxruntime cannot be imported" in by_extra["'itera-verify[onnx]'"].message
    assert by_extra["'itera-verify[onnx]'"].artifact == "exported" and by_extra["'itera-verify[gguf]'"].run == "base"
