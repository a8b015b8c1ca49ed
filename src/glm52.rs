//! GLM-5.2 expert-slot layout: the canonical layout and its validator (pure arithmetic).
