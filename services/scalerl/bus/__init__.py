"""The message bus between roles: one interface, chosen by URL (`memory://`, `kafka://host:port`).

Topics are per job (`<job>.prompts`, `.rollouts`, `.scored`, `.policy`, `.metrics`, `.dlq`); keys are
prompt ids so that a prompt group stays on one partition. Consumers commit offsets only after their
output is produced; a record that cannot be decoded goes to the dead-letter topic.
"""

from scalerl.bus.base import Bus, Consumer, Record, TopicNames
from scalerl.bus.factory import open_bus

__all__ = ["Bus", "Consumer", "Record", "TopicNames", "open_bus"]
