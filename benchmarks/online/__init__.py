"""Online learning benchmark: how fast a head learned from served traffic catches up with the offline one."""
