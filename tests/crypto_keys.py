"""``durable_agents.testing._crypto_keys`` under the tests' old import path.

The module moved into the package, where bench/ and scripts/ import it too.
"""

from durable_agents.testing._crypto_keys import *  # noqa: F403
