"""The experiment harness behind ``kvpool demo`` and the Mooncake side-by-side.

One module per concern, each imported by what needs it (the CLIs import ``config`` at once
and the rest only when they run: the rest loads torch, gRPC and the controller):

* ``config``: what one run is told (``DemoConfig``, ``VsConfig``), validated;
* ``workload``: the request stream and the chunks it reads (synthetic waves or a trace);
* ``testbed``: the Mininet star with real agents in every host, the controller per mode,
  the replay (``Testbed``), and ``run_demo``, the demo from configuration to results;
* ``capture``: what crossed the holder link (port counters, a tcpdump capture read with
  scapy, incast degree);
* ``report``: per-mode and per-system results, their tables, JSON documents and plots;
* ``sidebyside``: Mooncake Store alone vs kvpool on the same star (``run_side_by_side``);
* ``ttft_config`` and ``ttft``: a real model on every host (``bmv2_topologies.ttft_host``),
  full prefill vs the prefix's KV fetched through kvpool, timed on the host's clock.

``bmv2_topologies/demo.py`` and ``bmv2_topologies/vs_mooncake.py`` are the demo's CLIs;
``bmv2_topologies/research.py`` is ``kvpool experiment`` (ttft here, the rest in the simulator).
"""
