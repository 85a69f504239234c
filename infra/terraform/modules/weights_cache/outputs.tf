output "file_system_id" {
  description = "EFS file system id of the weights cache (the PersistentVolume's volumeHandle)."
  value       = aws_efs_file_system.this.id
}

output "volume_handle" {
  description = "The EFS CSI volume handle of the engine pods' directory (file system::access point)."
  value       = "${aws_efs_file_system.this.id}::${aws_efs_access_point.engine.id}"
}
