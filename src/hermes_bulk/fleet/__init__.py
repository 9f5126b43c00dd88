"""What the workers of a fleet share: the backend from a URL, the Huey task, endpoint queues, who is alive."""
