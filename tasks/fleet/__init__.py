"""A fleet of boards training one model together: federated averaging rounds over an inventory
group (the fleet flow, deployment ``odl/fleet``). Each board trains on its own data; only its trained tensors come back;
the host averages them and starts the next round from the aggregate."""
