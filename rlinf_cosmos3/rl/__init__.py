"""Online RL of the Cosmos3 action policy (issue #32): the flow-SDE sampler's steps and log-probabilities
(:mod:`~rlinf_cosmos3.rl.flow_sde`), the chain on the policy's packed forward (:mod:`~rlinf_cosmos3.rl.action_chain`),
GRPO advantages (:mod:`~rlinf_cosmos3.rl.advantages`), the PPO-clip loss (:mod:`~rlinf_cosmos3.rl.ppo_loss`), GAE
(:mod:`~rlinf_cosmos3.rl.gae`), the value head (:mod:`~rlinf_cosmos3.rl.value_head`), PPO's critic on the actor
(:mod:`~rlinf_cosmos3.rl.critic`) and the KL term's reference weights (:mod:`~rlinf_cosmos3.rl.reference`). A layer-1 piece: it may import ``models``, never workers or runners."""
