

def solve(x):
    return x.clone()
