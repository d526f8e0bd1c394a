"""gRPC and protobuf for the roles: generated stubs (`scalerl.rpc.gen`), the dataclass <-> protobuf
codec (`convert`), the common server (`server`) and client helpers (`client`).

Importing this package makes sure the stubs exist and match protos/ (`codegen.ensure_generated`):
a cheap stamp check (sha256 of the .proto files), and a regeneration only when they are missing or
stale.
"""

from scalerl.rpc.codegen import ensure_generated

ensure_generated()
