"""placeholder"""
def add_parser(sub):
    pass
