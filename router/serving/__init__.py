"""The serving path on Ray: one request from render to completion, free of HTTP.

pipeline.py runs the stages; gate.py is where a request waits for a slot; pool_client.py is the one
way to a pool's replicas; replica_router.py and replica_ledger.py choose and track replicas inside
Ray Serve; predictor_client.py asks the predictor; rollout.py runs rollout plans; config.py is the
stack's typed configuration.
"""
