"""A training prompt the engine cannot take (its tokens fill the model's positions) is dead-lettered once as
"too_long" and its offset committed with the batch; the batch's other prompts are generated (#27 finding 6:
before, the engine raised on the whole batch, which was re-read after every restart, on every generator)."""

from __future__ import annotations

from scalerl.bus import TopicNames
from scalerl.bus.memory import MemoryBus
from scalerl.bus.validate import Limits
from scalerl.generator.role import GeneratorRole
from scalerl.generator.torch_engine import TorchEngine
from scalerl.messages import PromptTask, RolloutGroup
from scalerl.store import open_store


def test_a_prompt_that_fills_the_positions_is_dead_lettered_and_the_others_generated(tiny_spec, tiny_model,
                                                                                    tokenizer, tmp_path):
    spec = tiny_spec.model_copy(deep=True)
    spec.generation.group_size = 2
    spec.generation.prompts_per_batch = 4
    bus, topics = MemoryBus(), TopicNames("job")
    engine = TorchEngine(tiny_model, tokenizer, seed=0)
    limits = Limits(vocab_size=tokenizer.vocab_size + 64, group_size=2, max_completion_tokens=10_000)
    role = GeneratorRole(spec, engine, tokenizer, bus, open_store(f"file://{tmp_path}"), topics, limits,
                         group="job.generators")
    long_prompt = "1+" * engine.max_positions  # 2 characters a token or more with the char tokenizer
    for pid, text in (("ok-1", "12+34="), ("poison", long_prompt), ("ok-2", "5+6=")):
        bus.publish(topics.prompts, PromptTask(prompt_id=pid, epoch=0, prompt=text, answer="0", group_size=2,
                                               task="addition"), key=pid)

    assert role.run_once() == 3
    rollouts = [r.value for r in bus._logs[topics.rollouts]]
    assert all(isinstance(g, RolloutGroup) for g in rollouts)
    assert sorted(g.task.prompt_id for g in rollouts) == ["ok-1", "ok-2"]
    dead = bus._logs[topics.dlq]
    assert [r.key for r in dead] == ["poison"]
    assert dead[0].headers["reason"].startswith("too_long: the prompt is ")
    assert bus.committed("job.generators", topics.prompts) == 3  # nothing is read again
    assert role.run_once() == 0 and len(bus._logs[topics.dlq]) == 1
