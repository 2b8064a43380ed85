"""Finding where reduced precision breaks: the numerics guard (first module to overflow,
automatic fallback), dtype-mismatch errors located and explained, and the profile of
every module's range, headroom and error. Nothing here times anything.
"""
