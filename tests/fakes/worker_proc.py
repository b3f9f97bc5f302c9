"""``durable_agents.testing._worker_proc`` under the tests' old import path.

The module moved into the package, where bench/ and scripts/ import it too.
"""

from durable_agents.testing._worker_proc import *  # noqa: F403
