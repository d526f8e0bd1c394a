"""Weight sync: how each policy version gets from the learner to every generator through the store.

A version is a manifest plus bounded shards (`manifest`), encoded chunk by chunk as raw bits or a sparse
XOR delta against the version before (`codec`), published by the learner's `publisher.WeightPublisher`
and built by each generator's `reader.WeightReader` into a resident copy, shard by shard, every chunk checked
by its BLAKE3; `broadcast` pushes versions to a group of generators (`inbox` keeps what arrived).
"""
