"""The generated stubs agree with the checked-in protos (stamp, byte-for-byte regeneration, descriptors),
and a stale or missing generation is detected and redone."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from google.protobuf import descriptor_pb2

from scalerl.rpc import codegen
from scalerl.rpc.gen.scalerl.v1 import messages_pb2, services_pb2

REPO = Path(__file__).resolve().parents[3]
PROTOS = REPO / "protos"


def _without_json_names(fdp: descriptor_pb2.FileDescriptorProto) -> descriptor_pb2.FileDescriptorProto:
    """json_name is filled by protoc's descriptor set but not by CopyToProto; it is derived anyway."""
    def strip(msgs: object) -> None:
        for msg in msgs:  # type: ignore[attr-defined]
            for f in msg.field:
                f.ClearField("json_name")
            strip(msg.nested_type)
    strip(fdp.message_type)
    return fdp


def test_stamp_matches_the_checked_in_protos() -> None:
    assert codegen.default_proto_root() == PROTOS
    assert codegen.stamp_of(codegen.default_gen_dir()) == codegen.protos_digest(PROTOS)
    assert codegen.is_current(codegen.default_gen_dir(), PROTOS)


def test_generated_files_equal_a_fresh_generation() -> None:
    # regenerates into a temporary folder and compares every file byte for byte (stamp included)
    assert codegen.differences(codegen.default_gen_dir(), PROTOS) == []


def test_loaded_descriptors_equal_protoc_output(tmp_path: Path) -> None:
    fds = descriptor_pb2.FileDescriptorSet.FromString(codegen.descriptor_set(PROTOS, tmp_path / "set.pb"))
    by_name = {f.name: _without_json_names(f) for f in fds.file}
    assert sorted(by_name) == ["scalerl/v1/messages.proto", "scalerl/v1/services.proto"]
    for module in (messages_pb2, services_pb2):
        loaded = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(loaded)
        assert _without_json_names(loaded) == by_name[module.DESCRIPTOR.name]
    assert [s.name for s in by_name["scalerl/v1/services.proto"].service] == [
        "Generator", "Verifier", "Environment", "Learner", "Curriculum"]


def test_imports_point_into_the_generated_package() -> None:
    text = (codegen.default_gen_dir() / "scalerl" / "v1" / "services_pb2_grpc.py").read_text()
    assert "from scalerl.rpc.gen.scalerl.v1 import services_pb2" in text
    assert "from scalerl.v1 import" not in text


def test_stale_and_missing_stubs_are_regenerated(tmp_path: Path) -> None:
    root = tmp_path / "protos"
    shutil.copytree(PROTOS, root)
    gen = tmp_path / "gen"
    assert not codegen.is_current(gen, root)  # missing
    assert codegen.ensure_generated(gen, root) is True
    assert codegen.is_current(gen, root)
    assert codegen.ensure_generated(gen, root) is False  # current: nothing to do
    first = codegen.stamp_of(gen)
    proto = root / "scalerl" / "v1" / "messages.proto"
    text = proto.read_text()
    proto.write_text(text.replace("  string checksum = 3;", "  string checksum = 3;\n  int64 size_bytes = 4;"))
    assert not codegen.is_current(gen, root)  # stale: a .proto changed
    assert codegen.differences(gen, root) != []
    assert codegen.ensure_generated(gen, root) is True
    assert codegen.stamp_of(gen) != first
    assert "size_bytes" in (gen / "scalerl" / "v1" / "messages_pb2.pyi").read_text()
    assert codegen.differences(gen, root) == []
    assert not list(tmp_path.glob(".gen-*")), "temporary folders are cleaned up"


def test_check_command_exit_codes() -> None:
    ok = subprocess.run([sys.executable, "-m", "scalerl.rpc.codegen", "--check"], capture_output=True, text=True,
                        timeout=120, check=False)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "agrees with the protos" in ok.stdout


def test_concurrent_processes_generate_once(tmp_path: Path) -> None:
    """Roles that start together and find no stubs: one generates (under the lock), the others wait
    and find them current."""
    gen = tmp_path / "gen"
    code = ("import sys; from scalerl.rpc import codegen; from pathlib import Path; "
            "print(codegen.ensure_generated(Path(sys.argv[1]), Path(sys.argv[2])))")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(gen), str(PROTOS)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err for _, err in outs]
    assert sorted(out.strip() for out, _ in outs) == ["False", "False", "True"]
    assert codegen.differences(gen, PROTOS) == []


def test_stubs_written_under_another_grpcio_are_stale(monkeypatch) -> None:
    """pip's isolated build took a newer grpcio-tools than the image's grpcio: those stubs refused to load in
    every Pod. The stamp names the grpcio it was made under, so such stubs are regenerated here."""
    here = codegen.protos_digest(PROTOS)
    real = codegen.importlib.metadata.version
    monkeypatch.setattr(codegen.importlib.metadata, "version",
                        lambda name: "99.0.0" if name == "grpcio" else real(name))
    assert codegen.protos_digest(PROTOS) != here
    assert not codegen.is_current(codegen.default_gen_dir(), PROTOS)


def test_stale_stubs_in_a_lower_image_layer_are_replaced(tmp_path, monkeypatch) -> None:
    """In an image build the stubs' folder sits in a lower overlay layer, which cannot be renamed (EXDEV)."""
    import errno
    import pathlib

    gen = tmp_path / "gen"
    codegen.generate(gen, PROTOS)
    (gen / codegen.STAMP_NAME).write_text("stale\n")
    real_rename = pathlib.Path.rename

    def rename(self, target):  # type: ignore[no-untyped-def]
        if self == gen:
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        return real_rename(self, target)

    monkeypatch.setattr(pathlib.Path, "rename", rename)
    assert codegen.ensure_generated(gen, PROTOS) is True
    assert codegen.is_current(gen, PROTOS)
