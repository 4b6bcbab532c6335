"""Web and engine adapters for shmbus."""
