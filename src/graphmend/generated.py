"""The prefix of every name the rewrites add to a module (``_@gm_cond1``, ``_@gm_rt``).

Not a Python identifier, so no user's name can clash with one; shared by the rewrites
and by the runtime (which tells generated locals from the user's), without either
importing the other.
"""

PREFIX = "_@gm_"
