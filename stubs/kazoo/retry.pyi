class KazooRetry:
    def __init__(
        self,
        max_tries: int = 1,
        delay: float = 0.1,
        backoff: float = 2,
        max_jitter: float = 0.4,
        max_delay: float = 60.0,
        ignore_expire: bool = True,
    ) -> None: ...
