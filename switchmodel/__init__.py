"""Reference switch model: the kvpool pipeline in Python behind a real P4Runtime server.

``switchmodel.p4info`` reads P4Info, ``switchmodel.state`` holds the switch's control state,
``switchmodel.p4rt_server`` serves P4Runtime over gRPC; the ``kvpool-switch`` command runs it.
"""
