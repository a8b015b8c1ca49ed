import MLXKern

// mlxkern's element type under a name of its own: beside `import MLX`, the bare `DType` is
// ambiguous (MLX has one too), and `MLXKern.DType` names a member of the enum `MLXKern`.

/// mlxkern's `DType` (the element types its kernels take).
public typealias MLXKDType = DType
