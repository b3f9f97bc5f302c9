"""``durable_agents.testing._llm_server`` under the tests' old import path.

The module moved into the package, where bench/ and scripts/ import it too.
"""

from durable_agents.testing._llm_server import *  # noqa: F403
