"""Test doubles that tests, the benchmark and ``dlts demo`` share; never imported by the product on
its own. ``dlts_testing.fake_nvml`` is the fake NVML at the agent's ``nvml`` seam (and the demo's
``FakeDriver``); ``dlts-agent --fake-nvml`` and ``dlts demo --fake-nvml`` load it only when asked,
and refuse to where real ``/dev/nvidia*`` devices exist (``dlts_agent.nvml.real_gpu_devices``)."""
