#!/usr/bin/python3
"""Reference outer steps computed by PyTorch, for tests/optim/outer_test.cpp.

Input (little-endian): int32 mode, int32 rounds, int32 n, float32 p0, p1, p2, then phi0[n] and
per round the mode's arrays. Output: phi[n] and state[n] after every round (rounds x 2n floats).
  mode 0 DiLoCo: torch.optim.SGD(lr=p0, momentum=p1, nesterov=True), grad = delta_mean[n]
  mode 1 NoLoCo: m = p0*m - p1*delta_mean - p2*(phi - phi_mean); phi += m   (delta_mean, phi_mean)
  mode 2 NoLoCo one-tensor: m = p0*m + p1*(theta_mean - phi); phi += m     (theta_mean)
  mode 3 SparseLoCo pieces: e = p1*e + delta; phi -= p0*update_mean       (delta, update_mean)
  mode 4 SparseLoCo full step over R = int(p2) replicas (delta_1..delta_R): each replica's
         e_r = p1*e_r + delta_r; per 4096-value chunk the 64 largest |e_r| are sent and zeroed in
         e_r; phi -= p0 * mean_r(sent_r). State output is e_1.
"""
import struct
import sys

import numpy as np
import torch


def main(inp, out):
    raw = open(inp, "rb").read()
    mode, rounds, n = struct.unpack_from("<iii", raw, 0)
    p0, p1, p2 = struct.unpack_from("<fff", raw, 12)
    data = np.frombuffer(raw, dtype="<f4", offset=24)
    phi0 = torch.from_numpy(data[:n].copy())
    per = {0: 1, 1: 2, 2: 1, 3: 2, 4: int(p2)}[mode]
    arrays = torch.from_numpy(data[n:].copy()).view(rounds, per, n)
    results = []
    if mode == 0:
        p = torch.nn.Parameter(phi0.clone())
        opt = torch.optim.SGD([p], lr=p0, momentum=p1, nesterov=True)
        for r in range(rounds):
            p.grad = arrays[r, 0].clone()
            opt.step()
            results += [p.detach().clone(), opt.state[p]["momentum_buffer"].clone()]
    elif mode == 4:
        phi = phi0.clone()
        errors = [torch.zeros(n, dtype=torch.float32) for _ in range(per)]
        for r in range(rounds):
            sent = []
            for i in range(per):
                e = errors[i] * p1 + arrays[r, i]
                s = torch.zeros(n, dtype=torch.float32)
                for lo in range(0, n, 4096):
                    part = e[lo:lo + 4096]
                    idx = torch.topk(part.abs(), min(64, part.numel())).indices + lo
                    s[idx] = e[idx]
                    e[idx] = 0.0
                errors[i] = e
                sent.append(s)
            phi = phi - p0 * torch.stack(sent).mean(0)
            results += [phi.clone(), errors[0].clone()]
    else:
        phi = phi0.clone()
        state = torch.zeros(n, dtype=torch.float32)
        for r in range(rounds):
            if mode == 1:
                state = p0 * state - p1 * arrays[r, 0] - p2 * (phi - arrays[r, 1])
                phi = phi + state
            elif mode == 2:
                state = p0 * state + p1 * (arrays[r, 0] - phi)
                phi = phi + state
            else:
                state = p1 * state + arrays[r, 0]
                phi = phi - p0 * arrays[r, 1]
            results += [phi.clone(), state.clone()]
    open(out, "wb").write(torch.stack(results).numpy().astype("<f4").tobytes())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
