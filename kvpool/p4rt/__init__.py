"""P4Runtime for kvpool: the P4Info reader and the one codec both the controller and the model use.

Needs the ``p4runtime`` protobufs (the ``kvpool[p4runtime]`` extra, protobuf < 3.21): the
host agent never imports this package, so it can live beside protobuf 6.
"""
