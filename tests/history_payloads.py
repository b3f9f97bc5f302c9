"""``durable_agents.testing._history_payloads`` under the tests' old import path.

The module moved into the package, where bench/ and scripts/ import it too.
"""

from durable_agents.testing._history_payloads import *  # noqa: F403
