"""A generator's end of the broadcast path in a process of its own (tests/unit/weightsync/test_broadcast.py).

`python broadcast_member.py STORE_DIR PORT MEMBER_ID TIMEOUT_S`: a `WeightReader` over the store folder and a
`BroadcastReceiver` delivering into its inbox. Each line on stdin is a `PolicyVersion` as JSON; for each it
builds that version and prints one JSON line: version, the SHA-256 of its bits (tensors by name), bytes
downloaded and bytes taken from the broadcast, and the receiver's counters.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys

from scalerl.messages import PolicyVersion
from scalerl.store.local import LocalStore
from scalerl.weightsync.broadcast import BroadcastReceiver, BroadcastSettings
from scalerl.weightsync.codec import bits_of
from scalerl.weightsync.reader import WeightReader


def bits_digest(weights: dict) -> str:
    h = hashlib.sha256()
    for name in sorted(weights):
        h.update(name.encode())
        h.update(bits_of(weights[name].contiguous()).numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    store_dir, port, member_id, timeout_s = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
    reader = WeightReader(LocalStore(store_dir))
    receiver = BroadcastReceiver(BroadcastSettings("127.0.0.1", port, timeout_s=timeout_s), member_id,
                                 reader.offer_shards, reader.push_ended,
                                 reader.inbox.buffer)
    for line in sys.stdin:
        pv = PolicyVersion(**json.loads(line))
        weights = reader.fetch(pv)
        print(json.dumps({"version": pv.version, "digest": bits_digest(weights), "downloaded": reader.stats.bytes,
                          "pushed": reader.stats.pushed, "received": receiver.received,
                          "failures": receiver.failures}), flush=True)
    receiver.close()


if __name__ == "__main__":
    main()
