"""``reef demo``: simulated users with a hidden preference teach a live Reef, and the demo shows
the score before and after, the releases and a learning curve (docs/demo.md).

``run`` drives it, ``server`` is the child ``reef serve`` and the client calls, ``preference``
and ``questions`` what the users want and ask, ``plot`` the PNG, ``cli`` the command.
"""
