print("iapbench")
