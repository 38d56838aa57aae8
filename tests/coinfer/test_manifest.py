import json

import pytest

from coinfer.manifest import ManifestError, identity, verify_manifest, write_manifest


@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "model.onnx").write_bytes(b"\x08\x07graph" * 100)
    (d / "tokenizer.json").write_text('{"model": {}}')
    write_manifest(d, {"scheme": "dynamic", "providers": ["CPUExecutionProvider"]})
    return d


def test_intact_directory_verifies(model_dir):
    m = verify_manifest(model_dir)
    assert m["scheme"] == "dynamic" and set(m["files"]) == {"model.onnx", "tokenizer.json"}


def test_tampered_file_is_refused_by_name(model_dir):
    data = bytearray((model_dir / "model.onnx").read_bytes())
    data[10] ^= 0xFF
    (model_dir / "model.onnx").write_bytes(bytes(data))
    with pytest.raises(ManifestError, match=r"model.onnx: sha256 mismatch"):
        verify_manifest(model_dir)


def test_truncated_and_missing_files_are_refused(model_dir):
    (model_dir / "tokenizer.json").write_text("{")
    with pytest.raises(ManifestError, match=r"tokenizer.json: 1 bytes, manifest says 13"):
        verify_manifest(model_dir)
    (model_dir / "tokenizer.json").unlink()
    with pytest.raises(ManifestError, match=r"tokenizer.json: listed in the manifest but missing"):
        verify_manifest(model_dir)


def test_no_manifest_is_refused_unless_allowed(model_dir):
    (model_dir / "manifest.json").unlink()
    with pytest.raises(ManifestError, match="manifest.json: missing"):
        verify_manifest(model_dir)
    assert verify_manifest(model_dir, allow_unverified=True) is None


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        json.dumps({"format": "other", "files": {}}),
        json.dumps({"format": "coinfer-model", "files": {"../x": {}}}),
    ],
)
def test_bad_manifests_are_refused(model_dir, text):
    (model_dir / "manifest.json").write_text(text)
    with pytest.raises(ManifestError, match="manifest.json"):
        verify_manifest(model_dir)


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda m: m.update(files=[]), "files"),
        (lambda m: m.update(version=2), "version"),
        (lambda m: m["files"]["model.onnx"].update(bytes="1300"), "files.model.onnx.bytes"),
        (lambda m: m["files"]["model.onnx"].update(bytes=-1), "files.model.onnx.bytes"),
        (lambda m: m["files"]["model.onnx"].update(sha256="z" * 64), "files.model.onnx.sha256"),
        (lambda m: m["files"]["model.onnx"].update(extra=1), "files.model.onnx.extra"),
        (lambda m: m.update(checks="passed"), "checks"),
        (lambda m: m["files"].update({"manifest.json": m["files"]["model.onnx"]}), "files"),
    ],
)
def test_a_manifest_of_the_wrong_shape_is_refused_naming_the_field(model_dir, change, field):
    """Schema-checked on load: well-formed JSON of the wrong shape is an error naming the field,
    never an AttributeError or a silent pass."""
    m = json.loads((model_dir / "manifest.json").read_text())
    change(m)
    (model_dir / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ManifestError, match=rf"invalid manifest: {field}"):
        verify_manifest(model_dir)


def test_an_artefacts_identity_is_its_contents_digest_never_its_path(model_dir, tmp_path):
    import shutil

    copy = tmp_path / "elsewhere" / "m"
    shutil.copytree(model_dir, copy)
    a, b = identity(model_dir, verify_manifest(model_dir)), identity(copy, verify_manifest(copy))
    assert a == b and a.startswith("sha256:") and str(tmp_path) not in a and len(a) <= 128
    (copy / "model.onnx").write_bytes(b"another graph")
    write_manifest(copy, {})
    assert identity(copy, verify_manifest(copy)) != a
    bare = identity(tmp_path, None)  # an unverified directory: its path's digest, not the path
    assert bare.startswith("path-sha256:") and str(tmp_path) not in bare and len(bare) <= 128
