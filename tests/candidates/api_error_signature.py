

def solution(x, y, z):
    return x + y + z
