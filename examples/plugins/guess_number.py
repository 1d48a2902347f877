"""A multi-turn task for kuberl in one file, with no change to kuberl: the policy guesses the
example's answer and is told "higher" or "lower" until it is right (reward 1) or out of turns.

    algorithm:
      name: grpo
      plugins: [{path: examples/plugins/guess_number.py}]
    rollout:
      multiTurn: {environment: guess_number, environmentOptions: {reward: 1.0}, maxTurns: 4}
"""

import re

from kuberl.engine.agents import Environment, Observation, register_environment

NUMBER = re.compile(r"-?\d+")


class GuessNumber(Environment):
    def __init__(self, reward: float):
        self.reward, self.secret = reward, 0

    def reset(self, example, messages):
        self.secret = int(example.answer)
        return messages

    def step(self, text: str) -> Observation:
        guesses = NUMBER.findall(text)
        if not guesses:
            return Observation([{"role": "user", "content": "Say a number."}])
        guess = int(guesses[-1])
        if guess == self.secret:
            return Observation(reward=self.reward, done=True)
        return Observation([{"role": "user", "content": "Higher." if guess < self.secret else "Lower."}])


@register_environment("guess_number", summary="guess the answer; told higher or lower until right")
def guess_number(setup, reward: float = 1.0) -> Environment:
    return GuessNumber(reward)
