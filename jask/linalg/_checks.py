"""Shape checks shared by the elementwise ops."""


def same_shape(name, *shapes):
    if any(s != shapes[0] for s in shapes[1:]):
        raise ValueError(f"{name} got incompatible shapes {', '.join(map(str, shapes))}; "
                         "jask elementwise ops need equal shapes (no broadcasting)")
    return shapes[0]
