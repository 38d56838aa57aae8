import json

import pytest

from coinfer.manifest import ManifestError, verify_manifest, write_manifest


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


@pytest.mark.parametrize("text", ["{not json", json.dumps({"format": "other", "files": {}}),
                                  json.dumps({"format": "coinfer-model", "files": {"../x": {}}})])
def test_bad_manifests_are_refused(model_dir, text):
    (model_dir / "manifest.json").write_text(text)
    with pytest.raises(ManifestError, match="manifest.json"):
        verify_manifest(model_dir)

