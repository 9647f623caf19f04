"""highway-env's step without its two hot spots, giving the same bytes as the stock package.

A profile of ``highway-fast-v0``'s step (benchmarks/highway_step.py) puts most of the time in the other
vehicles' IDM/MOBIL behaviour, whose ``Road.neighbour_vehicles`` projects *every* vehicle on the searched
lane (``lane.local_coordinates`` + ``lane.on_lane``), and in ``KinematicObservation.observe``, which builds
pandas DataFrames for a 5×5 table.  Two narrow replacements, applied only to the environments crop makes
(:func:`speed_up`; the installed package is untouched):

* :class:`FastRoad` ``neighbour_vehicles``: one vectorised projection keeps the vehicles that may lie on a
  straight lane (a margin of 1e-6 m over highway-env's own test absorbs the rounding of the vectorised
  arithmetic), then runs highway-env's own exact test and comparison on those, in the road's order.  A vehicle
  the exact test accepts is never dropped, so the front and rear vehicles are the stock ones.
* :class:`FastKinematicObservation` ``observe``: the same ``to_dict`` rows, the same float64 affine map
  ``lmap`` and clip per column, the same zero rows, cast to float32 last, in numpy instead of pandas.

tests/test_highway_fast.py checks observations (bytes), rewards, terminated/truncated and info against the
stock environment over many seeds.
"""
from __future__ import annotations

import numpy as np
from highway_env import utils
from highway_env.envs.common.observation import KinematicObservation
from highway_env.envs.highway_env import HighwayEnvFast
from highway_env.road.lane import StraightLane
from highway_env.road.road import Road
from highway_env.vehicle.objects import Landmark

__all__ = ["FastRoad", "FastKinematicObservation", "FastHighwayEnvFast", "speed_up"]

_SLACK = 1e-6  # metres beyond highway-env's on_lane bounds; the vectorised projection errs by ~1e-12 m


class FastRoad(Road):
    """A :class:`Road` whose ``neighbour_vehicles`` skips the vehicles far from a straight searched lane."""

    def neighbour_vehicles(self, vehicle, lane_index=None):
        lane_index = lane_index or vehicle.lane_index
        if not lane_index or self.neighbour_vehicles_connected_lanes:
            return super().neighbour_vehicles(vehicle, lane_index)
        lane = self.network.get_lane(lane_index)
        if type(lane) is not StraightLane:
            return super().neighbour_vehicles(vehicle, lane_index)
        others = [v for v in self.vehicles + self.objects if v is not vehicle and not isinstance(v, Landmark)]
        s = lane.local_coordinates(vehicle.position)[0]
        s_front = s_rear = None
        v_front = v_rear = None
        if others:
            delta = np.array([v.position for v in others], dtype=float) - lane.start
            lon = delta[:, 0] * lane.direction[0] + delta[:, 1] * lane.direction[1]
            lat = delta[:, 0] * lane.direction_lateral[0] + delta[:, 1] * lane.direction_lateral[1]
            near = (np.abs(lat) <= lane.width / 2 + 1 + _SLACK) & (lon >= -lane.VEHICLE_LENGTH - _SLACK) \
                & (lon < lane.length + lane.VEHICLE_LENGTH + _SLACK)
            others = [v for v, keep in zip(others, near.tolist()) if keep]
        for v in others:  # highway-env's own test and comparison (Road.neighbour_vehicles), in the road's order
            s_v, lat_v = lane.local_coordinates(v.position)
            if not lane.on_lane(v.position, s_v, lat_v, margin=1):
                continue
            if s <= s_v and (s_front is None or s_v <= s_front):
                s_front = s_v
                v_front = v
            if s_v < s and (s_rear is None or s_v > s_rear):
                s_rear = s_v
                v_rear = v
        return v_front, v_rear


class FastKinematicObservation(KinematicObservation):
    """``KinematicObservation.observe`` in numpy: the same float64 values and operations as pandas'."""

    def observe(self) -> np.ndarray:
        if not self.env.road:
            return np.zeros(self.space().shape)
        ego = self.observer_vehicle
        rows = [ego.to_dict()]
        close = self.env.road.close_objects_to(ego, self.env.PERCEPTION_DISTANCE, count=self.vehicles_count - 1,
                                               see_behind=self.see_behind, sort=self.order == "sorted",
                                               vehicles_only=not self.include_obstacles)
        if close:
            origin = ego if not self.absolute else None
            rows += [v.to_dict(origin, observe_intentions=self.observe_intentions)
                     for v in close[-self.vehicles_count + 1:]]
        table = np.array([[float(d[f]) for f in self.features] for d in rows], dtype=np.float64)
        if self.normalize:
            self._normalize(table)
        if len(rows) < self.vehicles_count:
            table = np.concatenate([table, np.zeros((self.vehicles_count - len(rows), len(self.features)))])
        if self.order == "shuffled":
            self.env.np_random.shuffle(table[1:])
        return table.astype(self.space().dtype)

    def _normalize(self, table: np.ndarray) -> None:
        """``normalize_obs`` on the table's columns, in place (it also fills ``features_range`` on first use)."""
        if not self.features_range:
            self.normalize_obs({})  # the stock ranges, from the observer's lanes
        for feature, f_range in self.features_range.items():
            if feature in self.features:
                j = self.features.index(feature)
                col = utils.lmap(table[:, j], [f_range[0], f_range[1]], [-1, 1])
                table[:, j] = np.clip(col, -1, 1) if self.clip else col


class FastHighwayEnvFast(HighwayEnvFast):
    """``highway-fast-v0`` with :class:`FastRoad` and :class:`FastKinematicObservation` in place of exactly the
    stock classes (a scene with another road or observation type keeps its own)."""

    def _reset(self) -> None:
        super()._reset()
        if type(self.road) is Road:
            self.road.__class__ = FastRoad

    def define_spaces(self) -> None:
        super().define_spaces()
        if type(self.observation_type) is KinematicObservation:
            self.observation_type.__class__ = FastKinematicObservation


_FAST = {HighwayEnvFast: FastHighwayEnvFast}


def speed_up(env):
    """``env`` (a gymnasium-wrapped highway-env environment) with the fast road and observation, when its
    scene class has a fast twin; returned unchanged otherwise.  The class is swapped on this instance only."""
    base = env.unwrapped
    fast = _FAST.get(type(base))
    if fast is not None:
        base.__class__ = fast
    return env
