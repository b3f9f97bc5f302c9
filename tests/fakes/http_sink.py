"""``durable_agents.testing._http_sink`` under the tests' old import path.

The module moved into the package, where bench/ and scripts/ import it too.
"""

from durable_agents.testing._http_sink import *  # noqa: F403
