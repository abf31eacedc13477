# The rig's fixtures (rig, make_rig) for every component suite.
from tests.component.rig import make_rig, rig  # noqa: F401
