"""One small module per method: its paper's config dataclass and its `Method` subclass (register
it in `decoding.METHOD_MODULES`). `block_draft` is the base the block-diffusion methods share."""
