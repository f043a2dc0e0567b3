"""Reference switch model: the kvpool pipeline in Python behind a real P4Runtime server.

``switchmodel.state`` holds the switch's control state, ``switchmodel.p4rt_server`` serves
P4Runtime over gRPC (P4Info and messages through :mod:`kvpool.p4rt`), ``switchmodel.pipeline``
runs packets through the program; the ``kvpool-switch`` command runs it.
"""
