import math

from dpgrid.strategies.noisy_gd import NoisyGD


class PUR(NoisyGD):
    """The PUR paper's data-independent schedules (Proposition 3), step size eta = 1/(2M):

        convex (lambda = 0):            sigma_t = 4 M R / (sqrt(d) t),                             t = 1, 2, ...
        strongly convex (lambda > 0):   sigma_t = sqrt(2 mu Delta_0 (1 - mu/(2M))^t / d),  mu = lambda,  t = 0, 1, ...

    Delta_0 = F(theta_0) - F* is bounded by log 2 (theta_0 = 0 gives F(theta_0) = log 2 and F* >= 0), which
    keeps the schedule data-independent. The convex schedule decays as 1/t: the paper's zCDP cost is then
    O(t^2) per step and O(T^3) in total (its Proposition 4 and the text after it), which fixes the reading
    of its "4MR / sqrt(d t)" as 4MR / (sqrt(d) t).
    """

    label = "PUR (ours)"

    @classmethod
    def sigmas(cls, hp: dict, problem: dict):
        d, m, mu = problem["d"], problem["smoothness"], problem["l2"]
        t = 0
        while True:
            t += 1
            if mu > 0:
                yield math.sqrt(2 * mu * math.log(2) * (1 - mu / (2 * m)) ** (t - 1) / d)
            else:
                yield 4 * m * problem["radius"] / (math.sqrt(d) * t)
