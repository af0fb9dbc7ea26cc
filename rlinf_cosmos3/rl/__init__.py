"""Online RL of the Cosmos3 action policy (issue #32): the flow-SDE sampler's steps and log-probabilities
(:mod:`~rlinf_cosmos3.rl.flow_sde`). A layer-1 piece: it may import ``models``, never workers or runners."""
