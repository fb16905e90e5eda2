raise RuntimeError("half-written policy")
