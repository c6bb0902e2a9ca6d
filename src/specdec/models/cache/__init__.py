"""KV caches: the dynamic engine's preallocated one and the static, position-indexed one."""
