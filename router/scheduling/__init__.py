"""The scheduling core: pure decisions, shared by the router and the simulator.

No asyncio, no Ray, no HTTP: the request record (request.py), the policies that pick a pool
(policies.py), the ranking, admission and release of waiting requests (scheduler.py, admission.py),
replica choice (replica_choice.py) and rollout plans (rollout_plans.py). The router runs them on
its event loop (router/serving/), the simulator on a modelled clock (benchmarks/simulator/).
"""
