"""A test function whose module fails at import, as a broken deploy would."""

raise RuntimeError("broken at import")


def lambda_handler(event: object, context: object) -> None:  # never reached
    return None
