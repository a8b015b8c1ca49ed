//! GLM-5.2 expert-slot layout: `mlxk_glm52_layout_canonical`, `mlxk_glm52_layout_validate`.
