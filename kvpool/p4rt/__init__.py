"""P4Runtime for kvpool: the P4Info reader and the one codec both the controller and the model use.

Needs the ``p4runtime`` protobufs (and so protobuf < 3.21): the host agent never imports
this package.
"""
