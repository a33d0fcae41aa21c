"""The worker: claim, lease, heartbeat, run, checkpoint, shut down."""
