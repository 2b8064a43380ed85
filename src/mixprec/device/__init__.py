"""The device and torch's process-wide numerics on it.

- :mod:`~mixprec.device.settings`: the numeric settings as data, and the parsing of their values;
- :mod:`~mixprec.device.backends`: the only writer of torch's global flags (snapshot, restore, contexts);
- :mod:`~mixprec.device.hardware`: the measured probe of what each dtype costs here.

Knows nothing about models or policies.
"""
