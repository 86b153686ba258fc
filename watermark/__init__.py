"""How tokens are watermarked: the PRF, the spec, the samplers. Pure algorithms, no I/O."""
