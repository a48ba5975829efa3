"""Open-file limits for a concurrency cap: a socket per request must fit the process's RLIMIT_NOFILE."""

from __future__ import annotations

import resource

from backends.base import BackendError


def fds_needed(max_concurrency: int) -> int:
    return max_concurrency + 64  # a socket per request, plus the process's own files


def check_fd_limit(max_concurrency: int) -> None:
    """Refuse, before any start, a concurrency cap the open-files hard limit cannot hold."""
    needed = fds_needed(max_concurrency)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise BackendError(
            f"--max-concurrency {max_concurrency} needs about {needed} open files but their hard "
            f"limit is {hard}; lower --max-concurrency or raise `ulimit -Hn`"
        )


def ensure_fd_limit(needed: int) -> None:
    """Raise the soft open-files limit so the concurrency cap, not EMFILE, bounds the sockets."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as e:  # an unlimited hard limit still ends at the kernel's nr_open
            raise BackendError(
                f"cannot raise the open-files limit to {needed} for --max-concurrency "
                f"({e}); lower --max-concurrency"
            ) from None
